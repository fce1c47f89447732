# Sourced by sbatch/payload.sbatch on Vista: module loads only.
module load gcc/13.2.0 cuda/12.8
