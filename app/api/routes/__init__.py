"""One ``APIRouter`` per domain; ``app.api.main.create_app`` includes them in this order:
operations, projects, labels, snapshots, items, queue, predictions, dashboard, workers."""
