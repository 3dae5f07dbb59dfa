"""Events (the run's source of truth), and the files derived from them."""
