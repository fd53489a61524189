"""In-flight records: framing now; stream elements, values and key groups build on it."""
