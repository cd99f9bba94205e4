"""One router per resource: checks, situations, labels, policy, health, metrics."""
