-- The Slurm array task (`<array job id>_<task id>`) and heterogeneous job component
-- (`<het job id>+<offset>`) a job is, as sacct writes them, from the job's environment or
-- scontrol; `report --job 123_4` and `--job 123+1` find a job by them. Filled in when a
-- later sample knows them, like the other names.
ALTER TABLE workloads ADD COLUMN array_task TEXT;
ALTER TABLE workloads ADD COLUMN het_component TEXT;
