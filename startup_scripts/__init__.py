"""Boot scripts for TPU hosts, rendered from Jinja templates (`rayslice.startup_scripts`)."""
