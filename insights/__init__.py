"""Layer 2 domain: forecasts (month-end spend, quota exhaustion) and idle-GPU detection from the
usage history. Pure rules; imports core and infra only. (Empty until its issue lands.)"""
