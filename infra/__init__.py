"""Pulumi components that declare the cloud side of a rayslice cluster (`rayslice.infra`)."""
