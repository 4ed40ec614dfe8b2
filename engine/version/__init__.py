"""The index-version format: manifest, verification, and the writers and readers of every file of a version."""
