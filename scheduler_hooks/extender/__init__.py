"""The kube-scheduler and Volcano extender: the policy answering the verbs, their wire formats,
and the HTTP server. Reads ``scheduler_hooks.cluster``; never imports the actuator."""
