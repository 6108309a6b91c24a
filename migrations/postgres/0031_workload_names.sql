-- Slurm's names for a job and the allow-listed labels of a pod or container, as the
-- agent resolves them from the runtime (the job's environment or scontrol; the
-- Kubernetes API; the Docker Engine API). Like the other names, filled in when a later
-- sample knows them, and the latest win. labels is a JSON object of strings.
ALTER TABLE workloads ADD COLUMN job_name TEXT;
ALTER TABLE workloads ADD COLUMN account TEXT;
ALTER TABLE workloads ADD COLUMN partition TEXT;
ALTER TABLE workloads ADD COLUMN job_user TEXT;
ALTER TABLE workloads ADD COLUMN labels TEXT;
