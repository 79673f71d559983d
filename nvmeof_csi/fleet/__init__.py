"""The controller's backend over the agents of the fabric map: placement, name reservations, the name census, the
capacity cache and the agents' health."""
