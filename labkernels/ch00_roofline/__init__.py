"""Chapter 00 — memory is the bottleneck: the roofline and the ops placed on it."""
