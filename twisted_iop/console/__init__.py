"""The static web console served by the Control Plane at /console."""
