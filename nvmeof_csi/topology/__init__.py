"""The fabric map of target agents, topology segments and placement of new volumes."""
