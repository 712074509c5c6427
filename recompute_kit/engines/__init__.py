"""Reference engines: the real training stacks the kit's numbers are checked against."""
