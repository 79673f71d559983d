"""The controller's storage backends behind ``TargetBackend``: the target agents of a fabric map (``agent``) and
the development-only loop backend (``loop``, with its node-side connector)."""
