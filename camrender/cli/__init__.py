"""Command line: the click commands and the checks they run before any model loads."""
