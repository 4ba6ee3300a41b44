"""sparkwal tracker layer (see the project README; built by its own issue)."""
