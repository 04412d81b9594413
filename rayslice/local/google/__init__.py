"""Fakes of Google's services that a simulated host or the recovery controller talks to: the GCE
metadata server (`metadata_server`), the metadata a host of each platform gets (`host_metadata`)
and the Cloud TPU / Compute Engine API emulation (`cloud_api`). They need no root and import
nothing else from `rayslice.local`."""
