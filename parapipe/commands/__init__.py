"""CLI command modules; importing one registers its commands on ``parapipe.app.app``."""
