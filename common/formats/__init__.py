"""The one reader of each file format hvdps reads, as typed records."""
