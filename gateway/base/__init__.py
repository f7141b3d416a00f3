"""The ground floor: settings, metrics and the log context, imported by every floor above and
importing none of them."""
