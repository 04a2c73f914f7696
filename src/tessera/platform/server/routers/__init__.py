"""One router per resource; each takes its caller from auth.current_user."""
