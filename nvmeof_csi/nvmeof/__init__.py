"""NVMe-oF backends: target (storage node, nvmet configfs) and initiator (GPU node, kernel host)."""
