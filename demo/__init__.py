"""The clienttools demo: a PyScript page (index.html, app.py) and its driver (drive.py)."""
