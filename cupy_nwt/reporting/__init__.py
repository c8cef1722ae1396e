"""Private: turning results into what people and machines read. Units, tables and JSON, plots,
progress on stderr, and the text that explains a tuner's pick."""
