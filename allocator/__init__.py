"""The allocator: a pure planner that binds claims to devices, and the controller that runs it."""
