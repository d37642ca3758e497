"""The HTTP API, one `APIRouter` per resource; `serving.app.create_app` includes them."""
