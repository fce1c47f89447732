# Sourced by sbatch/payload.sbatch on Vista, after it has initialised the module system: module
# loads only. A failing line stops the job before payload starts.
module load gcc/13.2.0 cuda/12.8
