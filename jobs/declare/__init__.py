"""The declaration: what a data engineer writes (`Pipeline`, its source, outputs and sinks), parsed and checked
without Spark. Imports nothing of onceflow's but itself."""
