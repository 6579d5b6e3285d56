"""The federated self-supervised methods, one file each, registered in :data:`federated.selfsup.FED_SSL`."""
