"""Dataset caching through Alluxio: the REST/job client, hydration of dataset volumes (the agent's filler),
cache locality for placement, and metrics."""
