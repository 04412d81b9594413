"""The local simulated slice: a fake GCE metadata server and network-namespace hosts (`rayslice.local`)."""
