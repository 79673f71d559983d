"""Identity issuance: what the controller checks before it signs, its Kubernetes CSR signer, and a node's or an
agent's own key and certificate (request and renewal)."""
