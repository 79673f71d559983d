"""Storage-node side: nvmet configfs model, backing stores, agent service (target-agent issue)."""
