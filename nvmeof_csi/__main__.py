from nvmeof_csi.main import app

app()
