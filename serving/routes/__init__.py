"""HTTP route groups of the service (FastAPI routers included by `serving.app.create_app`)."""
