"""Goodput of training runs and the record that outlives a cluster (docs/goodput.md, docs/history.md)."""
