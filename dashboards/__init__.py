"""Layer 3 component: what finance looks at. The offline finance report (and Grafana dashboards
as code). Imports core, infra and domain packages; never another component or app."""
