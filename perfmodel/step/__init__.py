"""The jittable physics of one strategy: roofline compute, alpha-beta collectives, memory and the
step time as a sum of named terms. Every function takes one strategy with scalar leaves."""
