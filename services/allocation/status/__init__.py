"""Device status on the claim (KEP-4817): conditions and data of each prepared device."""
