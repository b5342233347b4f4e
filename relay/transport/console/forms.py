"""The console's sign-in form (flask-wtf): ``email``, ``password`` and the hidden ``csrf_token``.

The other forms are a button and a token each; their fields are loaded by
``relay.schemas.console``.
"""

from __future__ import annotations

from flask_wtf import FlaskForm
from wtforms import EmailField, PasswordField
from wtforms.validators import DataRequired, Length


class LoginForm(FlaskForm):
    """Sign in with an operator's email and password (``relay operators create``)."""

    email = EmailField("Email", validators=[DataRequired("enter your email"), Length(max=320)])
    password = PasswordField("Password", validators=[DataRequired("enter your password"), Length(max=1024)])
