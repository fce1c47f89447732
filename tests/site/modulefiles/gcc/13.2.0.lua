-- A stand-in GCC module of the simulated site (tests only).
whatis("GCC 13.2.0 (simulated site)")
setenv("SIMULATED_SITE_GCC", "13.2.0")
