-- A stand-in CUDA module of the simulated site (tests only): sets what a site's cuda module sets,
-- pointing at no real toolkit.
whatis("CUDA 12.8 (simulated site)")
setenv("CUDA_HOME", "/opt/simulated-site/cuda-12.8")
setenv("SIMULATED_SITE_CUDA", "12.8")
