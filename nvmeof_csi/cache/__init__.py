"""Dataset caching through Alluxio: the REST/job client, dataset hydration, metrics."""
