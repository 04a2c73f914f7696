"""What a run leaves behind: its folder, logs, metrics and progress, and the summary read from them."""
