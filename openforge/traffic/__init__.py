"""Simulated production traffic: users whose harness sessions talk to the proxy in open mode
(no rollout registered), in all three dialects, with feedback that comes late or never."""
