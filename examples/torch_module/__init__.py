"""An nn.Module written here, on a torch Dataset written here."""
