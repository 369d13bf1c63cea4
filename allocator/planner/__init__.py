"""The pure planner: claims, slices, classes and nodes in; allocations or reasons out."""
