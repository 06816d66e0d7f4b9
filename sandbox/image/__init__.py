"""The Docker sandbox image: its offline build (build.py), Dockerfile, and in-jail runner (runner.py)."""
