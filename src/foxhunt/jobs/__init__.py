"""Jobs: graceful stop and progress reporting of training runs."""
