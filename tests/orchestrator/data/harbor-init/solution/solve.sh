#!/bin/bash

# Use this file to solve the task.
echo hello > /logs/artifacts/hello.txt
