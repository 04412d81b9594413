"""The emulation of the Cloud TPU and Compute Engine API calls that recovery and `rayslice status`
make (`emulator.CloudApiEmulator`), split by API and concern; see `emulator`."""
