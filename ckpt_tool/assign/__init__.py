"""State reassignment for a new parallelism, as Flink's StateAssignmentOperation does at restore."""
