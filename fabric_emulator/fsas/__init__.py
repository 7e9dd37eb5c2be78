"""The Fujitsu/Fsas CDI fabric manager API on the emulator's composition (docs/fabrics.md)."""
