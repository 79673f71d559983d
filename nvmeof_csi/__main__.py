from nvmeof_csi.cmd.main import app

app()
