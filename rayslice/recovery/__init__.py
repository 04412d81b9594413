"""Recovery of preempted or failed slices, and `rayslice status`.

`cloud` is the small REST client both use (Cloud TPU v2 and Compute Engine v1, Application
Default Credentials, endpoints overridable the way gcloud's are); `controller` watches this
cluster's slices and recreates a broken one whole; `events` records what it did; `commands`
holds `rayslice status`. Nothing here imports Pulumi: every name derives from the spec.
"""
