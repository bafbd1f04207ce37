"""Capturing a framework's training step as a profile (today: PyTorch: ``pytorch`` runs a capture;
the package's other modules are its parts, one idea each). It comes after ``layers`` in the flow
because a capture groups its operations into layers itself (by the model's module tree) and
records that grouping in the profile."""
