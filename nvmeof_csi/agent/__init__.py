"""The target agent of a storage node: nvmet configfs model, durable state, backing-file pool, volume, snapshot
and host/ANA operations, convergence (pure plan + applier), the gRPC servicer and the client."""
